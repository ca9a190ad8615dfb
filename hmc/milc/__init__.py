"""MILC compatibility: MILC's ks_imp_rhmc input decks (``hmc milc``) and MILC's own regression comparison
(``hmc check --milc``)."""
