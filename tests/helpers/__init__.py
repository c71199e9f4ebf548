"""Test helper modules: servers, harnesses and builders the tests share (import tests.helpers.X)."""
