"""The whole loop told as one story on a local stack (``./dev demo``, tests/e2e).

One support-assistant endpoint: batch optimization of its config with the society on
(``optimize``), the best configs as arms under simulated product traffic (``traffic``), pairs
from traces and SAO → a DPO job → policy v1 as a canary arm (``training``), the bandit's verdict
followed by the registry (``canary``), and an HTML report of it all (``report``). ``run.tell_story``
runs the stages in order; ``record.StoryRecord`` is what they produce."""
