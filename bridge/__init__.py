"""sfbridge: a store-and-forward bridge between NServiceBus SQL transport queues."""

__version__ = "0.1.0"
