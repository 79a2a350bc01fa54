"""What a deployment shows and says: node and job metrics, the dashboard and its alarms, job alerts."""
