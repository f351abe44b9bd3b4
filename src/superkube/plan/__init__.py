"""The offline plan: the Pulumi program run under the mock engine, its report and diagram, the
in-cluster layer read from it, policy evaluation, and the Pulumi.yaml schema. Imports `model` and
`cluster`."""
