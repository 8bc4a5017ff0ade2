"""Router mode: many models from ``--models-dir``, each served by a child ``bubo serve``.

``catalog`` finds the models, ``registry`` keeps their statuses, ``supervisor``
starts, health-checks and stops the children, ``proxy`` and ``routes`` forward
requests; ``app`` wires them (docs/router.md).
"""

from .app import create_router_app as create_router_app
from .app import drain as drain
from .app import start_draining as start_draining
from .command import inherited_flags as inherited_flags
