"""What every trial of one study shares: what the study optimises (``objective``: latency,
capacity or goodput), the model, window and workload prepared once (``prepare``) and the time
scale ``time_scale: auto`` resolves to (``calibrate``)."""
