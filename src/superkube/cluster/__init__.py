"""The facts a cluster is configured with, each named once: ports, groups, labels and taints, flags,
cloud-init, the autoscaler, monitoring, gang scheduling, jobs, the Ansible inventory's facts, and
Kubernetes objects checked against their schemas. Imports only `superkube.model`."""
