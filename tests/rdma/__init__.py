"""Verbs-transport tests (marker ``rdma``), run in the rxe VM: tests/rxe/run-in-vm.sh."""
