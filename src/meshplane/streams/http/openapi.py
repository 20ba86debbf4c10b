"""The streams API's OpenAPI 3.1 document, made from the route table (``GET /openapi.json``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from meshplane.version import __version__

if TYPE_CHECKING:
    from meshplane.streams.http.routes import Route


_PATTERN = re.compile(r"\{(\w+):[^{}]*\}")
_PARAMETER = re.compile(r"\{(\w+)\}")


def openapi_document(routes: list[Route]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        path = _PATTERN.sub(r"{\1}", route.path)  # aiohttp's {name:regex} is OpenAPI's {name}
        operation: dict[str, Any] = {
            "summary": route.summary,
            "tags": [route.tag],
            "operationId": route.handler.__name__,
            "responses": {
                "200": {"description": "OK"},
                "400": {"description": "bad input"},
                "404": {"description": "unknown room, topic or group"},
            },
        }
        params = _PARAMETER.findall(path)
        if params:
            operation["parameters"] = [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params
            ]
        if route.body:
            operation["requestBody"] = {
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                k: ({} if v == "any" else {"type": v}) for k, v in route.body.items()
                            },
                        }
                    }
                }
            }
        if not route.public:
            operation["security"] = [{"bearer": []}]
        paths.setdefault(path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "meshplane streams", "version": __version__},
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
