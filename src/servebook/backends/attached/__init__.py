"""Deployments servebook did not make: the place (``place``, a Place only: no up, no
down), their record (``record``), found by URL (``url``, ``listener``) or on Kubernetes
(``cluster``)."""
