"""The in-cluster layer: Kubernetes objects that pulumi-kubernetes creates once the API server answers."""
