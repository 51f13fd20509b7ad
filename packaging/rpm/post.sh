# autonode-agent %post.
# Local config (optional) and the agent's keys and state. Made here, not
# listed as package directories: cargo-generate-rpm 0.21 cannot package an
# empty directory.
install -d -m 0755 /etc/autonode
install -d -m 0700 /var/lib/autonode
# Enable the unit, never start it (the package goes into an AMI; the agent
# runs at the instance's boot). Only on a first install ($1 = 1): an
# upgrade keeps whatever the administrator chose. `systemctl enable` works
# offline, in image builds and chroots.
if [ "$1" -eq 1 ]; then
	systemctl --no-reload enable autonode-agent.service >/dev/null 2>&1 || :
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
fi
