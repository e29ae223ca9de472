"""The cluster's view: the one interface to a cluster (``cluster.py``), the Kubernetes
one (watches, capacity, DRA) and reconciling the queue with the pods (see README.md here)."""
