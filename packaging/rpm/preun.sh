# autonode-agent %preun: on the last removal ($1 = 0) drop the enablement
# symlinks. Never stop the unit: kubelet requires it and would be stopped.
if [ "$1" -eq 0 ]; then
	systemctl --no-reload disable autonode-agent.service >/dev/null 2>&1 || :
fi
