"""The harness: the pinned components built from their Go modules (`build`), and real control-plane
processes run on this machine beside a loopback API server (`apiserver`, `kwok`, `gang`,
`autoscaler`, `joins`), and a node's pod network in network namespaces (`podnet`). Tests and
benchmarks use it; no production command does, and it boots no host: the real-host lab
(`superkube.lab`) is a room of its own above it."""
