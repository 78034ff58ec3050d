"""What a study keeps: each trial's record on its Optuna study (``record``: the one module that
writes a trial's attributes and reads them back) and the storage the study is kept in
(``storage``: SQLite, a journal file, PostgreSQL)."""
