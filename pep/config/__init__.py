"""The gateway's configuration: the model (`model.GatewayConfig`), its rules (`validation`), the
settings table (`settings`: file keys, XSG_ variables, flags), reading it from flags, the
environment and a TOML file (`loading`), and the demo `xsg serve` sets up with no flags (`demo`).
"""
from pep.config.demo import DEMO_PORT, DEMO_USERS, ensure_data_dir, ensure_demo_auth_file
from pep.config.loading import ConfigError, load_settings, read_config_file, setting_origin
from pep.config.model import DEFAULT_MAX_CONTENT_LENGTH, DEFAULT_PORT, GatewayConfig
from pep.config.settings import SERVE_DEFAULTS, SETTING_HELP, Setting, settings
from pep.config.validation import MAX_SECONDS

__all__ = ["ConfigError", "DEFAULT_MAX_CONTENT_LENGTH", "DEFAULT_PORT", "DEMO_PORT", "DEMO_USERS",
           "GatewayConfig", "MAX_SECONDS", "SERVE_DEFAULTS", "SETTING_HELP", "Setting",
           "ensure_data_dir", "ensure_demo_auth_file", "load_settings", "read_config_file",
           "setting_origin", "settings"]
