"""The demo that `xsg serve` sets up with no flags: the data directory, and without --auth a
token file data/auth.json with random tokens for the example users (nea: administrator and
owner of the weather stream; lta, other and the AIS and MLS examples' users: consumers)."""
from __future__ import annotations

from typing import Any

from common.auth import AuthFileError, new_token, write_auth_file
from pep.config.model import GatewayConfig

# The port of Singapore for the AIS examples (policies/ais/, ASSIST Table 2): the port waters as
# a polygon (lat, lon pairs) and the port's point; the generator's ships sail there.
DEMO_PORT = {"port-bounds": [1.15, 103.60, 1.13, 103.85, 1.18, 104.05, 1.30, 104.05, 1.32, 103.85,
                             1.30, 103.60],
             "port-lat": 1.264, "port-lon": 103.84}

DEMO_USERS: tuple[tuple[str, list[str], bool, dict[str, Any]], ...] = (
    # subject, roles, admin, attributes
    ("nea", ["data-owner"], True, {}),
    ("lta", ["consumer"], False, {}),
    ("other", ["consumer", "port-authority", "medic", "clearance:1"], False,
     {"clearance": 1, **DEMO_PORT}),
    ("shipco", ["ship-company"], False, {"ship-list": [244000001, 244000003, 244000005]}),
    ("captain", ["ship-captain"], False, {"ship-mmsi": 244000007}),
    # multilevel security with categories (policies/mls/position-policy.xml): a label clearance
    ("analyst", ["analyst"], False, {"clearance": "S:{nuclear,crypto}"}),
)


def ensure_data_dir(config: GatewayConfig) -> None:
    config.data_dir.mkdir(parents=True, exist_ok=True)


def ensure_demo_auth_file(config: GatewayConfig) -> bool:
    """Create data_dir/auth.json with fresh random tokens when no --auth was given and it does
    not exist yet; returns True when it was created."""
    if config.auth_file is not None:  # not the demo's
        if not config.auth_file.is_file():
            raise AuthFileError(f"auth file {config.auth_file} does not exist")
        return False
    path = config.demo_auth_path
    if path.exists():
        return False
    write_auth_file(path, [{"token": new_token(), "subject": subject, "roles": roles,
                            "admin": admin, **({"attributes": attrs} if attrs else {})}
                           for subject, roles, admin, attrs in DEMO_USERS])
    return True
