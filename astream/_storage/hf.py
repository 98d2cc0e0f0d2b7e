"""``hf://datasets/<org>/<repo>[@revision]/<path>``: dataset files on the Hugging Face Hub (read-only).

Each file is read through the Hub's HTTP "resolve" endpoint,
``<endpoint>/datasets/<org>/<repo>/resolve/<revision>/<path>``, with
:class:`HttpStorage` (streamed, retried, resumed; the Hub redirects large files to
its CDN, which aiohttp follows, dropping the token on the way to another host).
``HF_TOKEN`` (or ``storage_options={"token": ...}``) opens private and gated repos;
``HF_ENDPOINT`` (or ``endpoint``) points at a mirror. The revision defaults to
``main``; a branch name with a ``/`` is written URL-encoded (``refs%2Fconvert%2Fparquet``).
"""

from __future__ import annotations

import os
import re
from urllib.parse import quote, unquote

from astream._storage.base import StorageOptions, TransferEvents
from astream._storage.http import HttpStorage
from astream.errors import ConfigError, UploadError

__all__ = ["HfStorage", "resolve_url"]

_HF_URL = re.compile(r"^hf://datasets/(?P<org>[^/@]+)/(?P<repo>[^/@]+)(?:@(?P<rev>[^/]+))?(?:/(?P<path>.*))?$")
_PUBLIC = "https://huggingface.co"


def resolve_url(url: str, endpoint: str = _PUBLIC) -> str:
    """The resolve-endpoint URL of an ``hf://datasets/...`` file.

    Raises:
        ConfigError: not an ``hf://datasets/<org>/<repo>[@revision]/<path>`` URL.
    """
    match = _HF_URL.match(url)
    if match is None:
        raise ConfigError(
            f"{url!r} is not an hf://datasets/<org>/<repo>[@revision]/<path> URL (only dataset repos are read)"
        )
    rev = quote(unquote(match.group("rev") or "main"), safe="")
    path = quote(match.group("path") or "", safe="/")
    return f"{endpoint.rstrip('/')}/datasets/{match.group('org')}/{match.group('repo')}/resolve/{rev}/{path}"


class HfStorage(HttpStorage):
    """Dataset files of a Hugging Face Hub repository, read-only."""

    schemes = ("hf",)
    option_keys = frozenset({"token", "endpoint", "headers", "ca_bundle"})
    credentials_hint = "set HF_TOKEN (or storage_options={'token': ...}) to a token that may read this repository"

    def __init__(self, options: StorageOptions | None = None, events: TransferEvents | None = None) -> None:
        super().__init__(options, events)
        config = self.options.remote
        self._endpoint = config.text("endpoint", "hf://") or os.environ.get("HF_ENDPOINT") or _PUBLIC
        token = config.text("token", "hf://") or os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}

    async def _request(self, url: str) -> tuple[str, dict[str, str]]:
        return resolve_url(url, self._endpoint), {**self._headers, **self._auth}

    async def put(self, local_path: str, url: str) -> None:
        raise UploadError(f"{url}: hf:// remotes are read-only; upload with huggingface_hub, then read them here")
