"""carbonflow.tracking — MLflow as carbonflow's memory.

Modules (import them directly; this package imports nothing heavy so DAG parsing stays fast)::

    uri.tracking_uri() -> str                        # $MLFLOW_TRACKING_URI or sqlite:///<home>/mlflow.db
    schema.SCHEMA, schema.schema_markdown()          # the one documented schema (README table)
    logger.log_training_run(spec, plan, result, *, profile=None, forecast=None, actual_points=None,
                            power_trace_csv=None, model_path=None, tracking_uri=None) -> TrackingOutcome
    logger.log_profile(spec, profile, *, tracking_uri=None) -> TrackingOutcome
    history.latest_profile(job, device_model, code_version, max_age_s, now, *, tracking_uri=None) -> Profile | None
    history.realised_vs_predicted(job) -> list[RealisedVsPredicted]
    history.job_history(jobs) -> carbonflow.planning.learning.JobHistory
    spool.replay_spool(tracking_uri=None) -> int      # outage spool under <home>/spool, idempotent replay
    report.build_report(job, *, tracking_uri=None, png_path=None) -> ReportData; report.render_table(data)
"""
