"""The deployment contract: what verify, bench, status and run may know about a running
deployment, whichever place runs it.

* ``view``: ``DeploymentView`` (its roles, each role's replicas, its claims, its entry URL
  and the route this process takes to it), the one replica-naming rule, and
  ``to_doc``/``from_doc`` for a load agent that runs elsewhere.
* ``reach``: ``Record`` (what a place knows of a deployment: roles, replicas, command
  lines) and ``Reach`` (how this process addresses each replica, and what route that is);
  ``build(record, reach)`` is the one function that makes a view.
* ``site``: ``LoadSite``, where bench's load runs: ``Here``, or what a place offers
  instead (on Kubernetes, a Job beside the servers).

Nothing here imports a backend: a place builds its view through ``reach.build`` and hands
it to verify and bench, which never ask which place made it.
"""

from servebook.deployment.view import Claims, DeploymentView, Replica, RoleView

__all__ = ["Claims", "DeploymentView", "Replica", "RoleView"]
