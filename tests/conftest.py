"""Shared fixtures. Real models are loaded once per session, from the project's registry."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests import their fakes and helpers by name
