"""The command modules of ``enginefit``: one per area, each registering its subcommands.

They sit above every stage: only they (and ``assets/``) read the whole configuration and hand
each stage its own section, so no stage imports the configuration tree.
"""
