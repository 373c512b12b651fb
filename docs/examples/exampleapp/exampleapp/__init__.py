"""An example app with its own cron job, push-queue topic and delivery channel."""
