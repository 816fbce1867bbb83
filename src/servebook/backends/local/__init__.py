"""The local place: engines as process groups on this machine (``deployer``), their
view (``view``) and the processes themselves (``processes``)."""
