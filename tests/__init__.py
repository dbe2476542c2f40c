"""Test package: lets tests import shared helpers as tests.<module>."""
