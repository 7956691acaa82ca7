"""Modules for translation / generation."""
