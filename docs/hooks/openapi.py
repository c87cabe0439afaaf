"""A mkdocs hook: the site carries the gateway's OpenAPI document, generated from the app.

`GET /openapi.json` on a gateway is `pep.http.openapi.build_openapi` over its routes; this hook
calls the same function over an app built with the embedded defaults in a temporary data
directory (no Spark is started), and adds the result to the site as `api/openapi.json`, which
`api/openapi.md` renders with Swagger UI (the mkdocs-swagger-ui-tag plugin, whose assets are
bundled: no CDN). So the site's document and a gateway's cannot drift apart.
"""
from __future__ import annotations

import json
import tempfile
from typing import Any

from mkdocs.structure.files import File, Files

OPENAPI_URI = "api/openapi.json"


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document a gateway of this tree serves at /openapi.json."""
    from pep.config.model import GatewayConfig
    from pep.http.app import create_app
    from pep.http.current import SERVICES_EXTENSION
    from pep.http.openapi import build_openapi

    with tempfile.TemporaryDirectory(prefix="xsg-docs-openapi-") as data_dir:
        app = create_app(GatewayConfig(data_dir=data_dir, start_spark=False))
        try:
            return build_openapi(app)
        finally:
            app.extensions[SERVICES_EXTENSION].close()


def on_files(files: Files, config: Any) -> Files:
    text = json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"
    files.append(File.generated(config, OPENAPI_URI, content=text))
    return files
