"""How many requests a second one server carries: the search over rates, pure (``rates``), the
probes it runs on a live server (``probes``), a capacity trial's search and where it starts
(``rate_search``), and what its figures mean in servers (``text``)."""
