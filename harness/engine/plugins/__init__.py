"""The harness's pytest plugins, one concern each; harness/engine/plugin.py registers them
from one list (as pytest registers its own default plugins)."""
