"""How jobs run: local (in the gateway processes) and kube (Kubernetes Jobs): see gateway.jobs."""
