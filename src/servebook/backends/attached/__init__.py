"""Deployments servebook did not make (a Place only): their record (``record``), found by
URL (``url``, ``listener``) or on Kubernetes (``cluster``)."""
