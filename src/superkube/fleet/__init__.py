"""Acting on a fleet: the project's one caller of ansible-runner (converge, etcd status)."""
