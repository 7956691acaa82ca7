"""Module defining models."""
