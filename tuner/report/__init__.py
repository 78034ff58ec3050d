"""What a study found, for people: its trials as rows and series (``data``), the figures
(``plots``, shared with the GPU runner in ``benchmarks/gpu``) and one HTML page (``page``); a
capacity study's latency against offered rate per configuration (``capacity``, ``rate_plot``).

Reads a study that ``tuner run`` wrote, through ``tuner.study.trials.search``; writes nothing
into it.
"""
