"""Notifications (docs/notifications.md): subscriptions, the event outbox, and the sender that delivers it."""
