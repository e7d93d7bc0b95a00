"""Whether the Hugging Face hub can be reached, asked once per process.

Offline, ``from_pretrained`` and ``load_dataset`` spend a minute in retries before they say a name is not
cached; one quick connection attempt instead switches the libraries to their own offline mode, in which a
cached name still loads and any other fails at once with the error that names the local alternatives.
``HF_HUB_OFFLINE=1`` (which the scripts set) skips the attempt.
"""

from __future__ import annotations

import functools
import socket
from urllib.parse import urlparse

import huggingface_hub.constants

#: Seconds one connection attempt to the hub may take.
PROBE_TIMEOUT_S = 3.0


@functools.lru_cache(maxsize=1)
def offline() -> bool:
    """True when the hub is not reachable (or ``HF_HUB_OFFLINE`` is set); then the hub libraries are offline too."""
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return True
    url = urlparse(huggingface_hub.constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=PROBE_TIMEOUT_S).close()
        return False
    except OSError:
        huggingface_hub.constants.HF_HUB_OFFLINE = True
        return True
