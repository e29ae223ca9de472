"""Test harness for fairgate's e2e tests: a real control plane, fake GPU nodes, fake kubelet."""
