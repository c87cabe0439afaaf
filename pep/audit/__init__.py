"""The audit trail: who was granted what, when, under which policy versions; what was refused,
revoked, released; which policies and streams changed. Append-only JSON lines, rotated."""
