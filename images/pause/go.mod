module superkube.images/pause

go 1.22
