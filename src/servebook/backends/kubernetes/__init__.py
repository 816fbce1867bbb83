"""The Kubernetes place: the objects rendered from a Plan (``deployer``), their record
(``record``), how a command reaches the Pods (``view``), waiting for objects to settle
(``settle``) and the load Job beside the engines (``job_site``)."""
