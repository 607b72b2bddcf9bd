"""Enroute test kit: drivers and fixtures shared by tests and benchmarks.

- ``enroute_testing.gitcli``: run the real git CLI with a scrubbed,
  reproducible environment (``git_env``, ``run_git``, ``GitFailed``).
- ``enroute_testing.repogen``: deterministic repositories from a ``RepoSpec``
  via ``git fast-import`` (``generate_repo``), and the helpers
  ``pack_objects``, ``all_objects`` and ``verify_pack`` around git's own pack
  tools.
- ``enroute_testing.jgit``: find JGit and its dependencies in the local Maven
  repository (``find_jgit_classpath``), for the JGit interop tests.
- ``enroute_testing.ledgers``: real ledger processes on 127.0.0.1
  (``start_three``: the three-voter cluster every multi-ledger test uses).
- ``enroute_testing.ready``: a role's ready line, read from its stdout or log.
- ``enroute_testing.waiting``: ``wait_until``/``until``, the bounded wait on a condition
  that tests use instead of a fixed sleep.

Production code never imports this package.
"""
