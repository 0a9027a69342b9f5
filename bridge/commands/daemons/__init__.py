"""`sfbridge daemons ...`: the daemons tables of the forwarding databases
(`bridge.storage.daemons`) in the operator's hands."""
