"""Placeholder: commands of this group are registered here."""
from __future__ import annotations
