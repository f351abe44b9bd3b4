"""The lab: real test hosts on this machine (systemd machines in network namespaces), their fabric
(instance metadata, the CNI runtime), and the components built and run there."""
