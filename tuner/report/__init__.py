"""What a study found, for people: its trials as rows and series (``data``), the figures
(``plots``, shared with the GPU runner in ``benchmarks/gpu``) and one HTML page (``page``).

Reads a study that ``tuner run`` wrote, through ``tuner.study.search``; writes nothing into it.
"""
