"""The `unstable` command line."""
