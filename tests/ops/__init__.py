"""Deployment files, TLS and advertised addresses."""
