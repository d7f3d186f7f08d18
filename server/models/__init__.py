"""The models a server serves: from configuration to a running batcher over engines.

The one configuration path: ``server.settings.Settings`` (flags and environment) ->
``plan.ModelPlan`` per model version (``repository/plan.py`` builds one per entry of a Triton
repository, ``plan.SettingsSource`` one from the settings alone) -> ``serving_config.ServingConfig``
(typed, built once; each layer reads its part). ``model_set`` (lookup, readiness, load,
unload, drain), ``runtime`` (one served model: engines, batcher, metrics), ``ensemble`` /
``ensemble_graph`` (Triton ensembles), ``response_cache``, ``metrics`` and ``batch_observer``
(serving metrics, the batcher's one observer).
"""
