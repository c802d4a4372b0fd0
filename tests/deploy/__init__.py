"""Tests of the deployment manifests and configs under deploy/."""
