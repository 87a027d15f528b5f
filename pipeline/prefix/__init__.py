"""Prefix sharing: the shared-prefix curve, reuse potential, its age and tenant split, and the
curve's shape. Session inference lives in :mod:`pipeline.prefix.sessions`; ``stage`` holds the contract
the asset and the command share."""
