module superkube.images/netload

go 1.22
