"""Plane and sphere geometry for the spatial predicates of the condition language, in pure Python.

One definition of every computation the spatial predicates make, shared by the condition
language's `evaluate` (the reference semantics, used by tests and brute force) and by the NR/PR
analysis. The Spark runtime (`pep/runtime/plans/spatial.py`) builds the same computations from
Column expressions, operation by operation in the same order, so that both sides agree bit for bit
on the plane tests (+, -, * and comparisons are correctly rounded in IEEE doubles on both) and to
within an ulp of sin/cos on the haversine distance (which matters only for a point exactly on a
circle).

Conventions, chosen so that they can be written down in one line each:
- Coordinates are degrees: latitude in [-90, 90], longitude in [-180, 180]. A tuple whose
  coordinate is missing, NaN or out of range has no position: every spatial predicate (and its
  negation) is false on it.
- Distance: haversine on a sphere of the mean Earth radius (IUGG R1 = 6,371,008.8 m), in metres.
  Not geodesic (WGS-84): the error against the ellipsoid is up to about 0.5 %.
- Polygons: the vertices are (lat, lon) pairs taken as plane coordinates; edges are straight
  lines in lat/lon (not great circles), the ring closes itself (repeating the first vertex at
  the end is allowed and changes nothing), no edge may cross the antimeridian (a polygon is
  never interpreted as wrapping around +-180). Inside is decided by even-odd ray casting; a
  point ON an edge or a vertex is inside (closed polygons, like WITHIN_BOX's closed bounds).
  Computed in doubles: a point within rounding error of a slanted edge may fall either way.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

EARTH_RADIUS_M = 6_371_008.8  # mean Earth radius (IUGG R1), metres
EARTH_DIAMETER_M = 2.0 * EARTH_RADIUS_M
MAX_DISTANCE_M = math.pi * EARTH_RADIUS_M  # half the circumference: no two points are farther
MAX_POLYGON_VERTICES = 1_000
METRES_PER_NAUTICAL_MILE = 1_852.0


def valid_position(lat: object, lon: object) -> bool:
    """A usable coordinate pair: two finite numbers within the latitude and longitude ranges."""
    if lat is None or lon is None or isinstance(lat, bool) or isinstance(lon, bool):
        return False
    if not isinstance(lat, (int, float)) or not isinstance(lon, (int, float)):
        return False
    return -90.0 <= lat <= 90.0 and -180.0 <= lon <= 180.0  # NaN fails both


def haversine(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance in metres on the mean-radius sphere (the runtime mirrors this
    sequence of operations exactly, see pep/runtime/plans/spatial.py)."""
    p1 = math.radians(lat1)
    p2 = math.radians(lat2)
    dp = math.radians(lat2 - lat1)
    dl = math.radians(lon2 - lon1)
    s1 = math.sin(dp / 2.0)
    s2 = math.sin(dl / 2.0)
    a = s1 * s1 + math.cos(p1) * math.cos(p2) * s2 * s2
    return EARTH_DIAMETER_M * math.asin(min(1.0, math.sqrt(a)))


def _edge(points: Sequence[float], i: int, n: int) -> tuple[float, float, float, float]:
    """(y_i, x_i, y_j, x_j) of edge i (from vertex j = i - 1 to vertex i), y = lat, x = lon."""
    j = (i + n - 1) % n
    return points[2 * i], points[2 * i + 1], points[2 * j], points[2 * j + 1]


def in_polygon(lat: float, lon: float, points: Sequence[float]) -> bool:
    """Even-odd ray casting, boundary included; `points` is lat1, lon1, lat2, lon2, ...

    Division-free (the runtime runs with ANSI arithmetic, where a division by zero fails): the
    ray from (x, y) towards +x crosses edge (i, j) when y is between the edge's ends (half-open,
    so a vertex is counted once) and c = (x - xi) * (yj - yi) - (y - yi) * (xj - xi) has the sign
    opposite to (yj - yi); c == 0 with (x, y) inside the edge's bounding box puts the point on
    the edge.
    """
    y, x = lat, lon
    n = len(points) // 2
    inside = False
    for i in range(n):
        yi, xi, yj, xj = _edge(points, i, n)
        dy = yj - yi
        c = (x - xi) * dy - (y - yi) * (xj - xi)
        if c == 0.0 and min(xi, xj) <= x <= max(xi, xj) and min(yi, yj) <= y <= max(yi, yj):
            return True
        if (yi > y) != (yj > y) and ((dy > 0.0 and c < 0.0) or (dy < 0.0 and c > 0.0)):
            inside = not inside
    return inside


def polygon_bbox(points: Sequence[float]) -> tuple[float, float, float, float]:
    """(south, west, north, east) of a polygon's vertices (it never wraps the antimeridian)."""
    lats, lons = points[0::2], points[1::2]
    return min(lats), min(lons), max(lats), max(lons)


def circle_bbox(lat: float, lon: float, radius: float
                ) -> tuple[float, float, float | None, float | None]:
    """A lat/lon box that contains every point within `radius` metres of (lat, lon), widened by
    a margin so that rounding can never put a point the runtime accepts outside it.

    Returns (south, north, west, east); west/east are None when no longitude bound is implied (a
    pole within reach, or a box across the antimeridian: then only latitudes are bounded).
    The bounds follow the usual derivation (J. P. Matuschek, "Finding points within a distance
    of a latitude/longitude using bounding coordinates"): latitudes lat +- r/R, longitudes
    lon +- asin(sin(r/R) / cos(lat)) when no pole is within reach.
    """
    margin = 1e-7 + 1e-9 * abs(radius) / EARTH_RADIUS_M  # degrees; ~1 cm at the equator
    angular = radius / EARTH_RADIUS_M
    south = math.degrees(math.radians(lat) - angular) - margin
    north = math.degrees(math.radians(lat) + angular) + margin
    if south <= -90.0 or north >= 90.0:
        return max(south, -90.0), min(north, 90.0), None, None
    ratio = math.sin(angular) / math.cos(math.radians(lat))
    if ratio >= 1.0:
        return south, north, None, None
    spread = math.degrees(math.asin(ratio)) + margin
    west, east = lon - spread, lon + spread
    if west < -180.0 or east > 180.0:
        return south, north, None, None
    return south, north, west, east


def convex(points: Sequence[float]) -> bool:
    """Whether the polygon is convex (every turn has the same sign, collinear turns allowed,
    and the ring winds around once), so that it contains the convex hull of any points in it."""
    n = len(points) // 2
    sign = 0
    total = 0.0
    for i in range(n):
        y0, x0 = points[2 * i], points[2 * i + 1]
        y1, x1 = points[2 * ((i + 1) % n)], points[2 * ((i + 1) % n) + 1]
        y2, x2 = points[2 * ((i + 2) % n)], points[2 * ((i + 2) % n) + 1]
        cross = (x1 - x0) * (y2 - y1) - (y1 - y0) * (x2 - x1)
        if cross != 0.0:
            s = 1 if cross > 0 else -1
            if sign and s != sign:
                return False
            sign = s
        a = math.atan2(y1 - y0, x1 - x0)
        b = math.atan2(y2 - y1, x2 - x1)
        turn = b - a
        while turn <= -math.pi:
            turn += 2 * math.pi
        while turn > math.pi:
            turn -= 2 * math.pi
        if (x1 - x0, y1 - y0) != (0.0, 0.0) and (x2 - x1, y2 - y1) != (0.0, 0.0):
            total += turn
    return sign != 0 and abs(abs(total) - 2 * math.pi) < 1e-6


def polygon_contains_points(polygon: Sequence[float], points: Sequence[float]) -> bool:
    """Whether every (lat, lon) of `points` is inside `polygon` (closed)."""
    return all(in_polygon(points[k], points[k + 1], polygon) for k in range(0, len(points), 2))


__all__ = ["EARTH_RADIUS_M", "MAX_DISTANCE_M", "MAX_POLYGON_VERTICES", "METRES_PER_NAUTICAL_MILE",
           "valid_position", "haversine", "in_polygon", "polygon_bbox", "circle_bbox", "convex",
           "polygon_contains_points"]
