# autonode-agent %postun: let a running systemd forget the unit and the
# kubelet drop-in.
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
fi
# Erased ($1 = 0): the node's keys and join state go with the package, as
# a .deb's purge does.
if [ "$1" -eq 0 ]; then
	rm -rf /var/lib/autonode
	rm -f /etc/autonode/kubelet.env
	rmdir /etc/autonode 2>/dev/null || :
fi
