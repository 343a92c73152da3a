"""Credentials never leave the process that was given them.

A tracking URI may carry a password (`https://user:pass@host`), a spec value may hold a
token. Everything rayparallel writes or shows (job.yaml, result.json, run.json, MLflow
params and tags, the console) goes through :func:`mask`; the real value is used only to
connect.

>>> mask_text("https://ann:hunter2@mlflow.example:5000/?token=abc&x=1")
'https://ann:***@mlflow.example:5000/?token=***&x=1'
>>> mask({"mlflow": {"tags": {"api_token": "abc"}}, "name": "run"})
{'mlflow': {'tags': {'api_token': '***'}}, 'name': 'run'}
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
_SECRET_KEY = re.compile(r"pass(word)?|secret|token|api[_-]?key|credential", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/@:\s]*:)[^/@\s]+@", re.IGNORECASE)
_URL_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]*@", re.IGNORECASE)
_SECRET_PARAM = re.compile(
    r"(?P<head>[?&](?:token|access_token|api_key|apikey|password|secret|sig|signature)=)[^&#\s]+", re.IGNORECASE
)


def mask_text(text: str) -> str:
    """`text` with URL passwords and secret query parameters replaced by `***`."""
    text = _URL_PASSWORD.sub(rf"\g<head>{MASK}@", text)
    return _SECRET_PARAM.sub(rf"\g<head>{MASK}", text)


def mask(tree: Any) -> Any:
    """A copy of a nested dict/list with every secret-named key's value and every URL password masked."""
    if isinstance(tree, dict):
        return {
            key: MASK if _SECRET_KEY.search(str(key)) and isinstance(value, str) and value else mask(value)
            for key, value in tree.items()
        }
    if isinstance(tree, (list, tuple)):
        return type(tree)(mask(value) for value in tree)
    if isinstance(tree, str):
        return mask_text(tree)
    return tree


def without_credentials(uri: str) -> str:
    """`https://user:pass@host/x` -> `https://host/x`: a link to show or hand to another machine."""
    return _URL_USERINFO.sub(r"\g<scheme>", uri)
