"""A differential harness over the Agents SDK's own test suite: its tests that call the runner,
run in-process and on FleetRunner (``make sdk-suite``; results in docs/sdk-suite.md).

- ``_sdist``: the pinned sdist, fetched and checked; its tests extracted;
- ``_session``: one pytest session of the SDK's suite in its own virtualenv, with the plugins
  of ``plugins/`` (``sdk_suite_record`` records each test, ``sdk_suite_fleet`` routes the
  runner to FleetRunner on an InProcessFleet);
- ``_causes``: ``causes.toml``, the committed mapping from a failure to its cause;
- ``_report``: the figures and the page;
- ``selected.txt``: the selection, committed so a run is stable and drift is seen.
"""
