"""Handles: the live grants a consumer reads from, their buffers, the one-window rule, and
revocation that keeps them in step with the policies."""
