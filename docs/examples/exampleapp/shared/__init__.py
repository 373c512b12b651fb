"""The app's own ``shared`` package: a common name, which Sluice's wheel no longer takes."""
