package feed

// ReferenceTab is a tab's rows by their definition alone, every row of user
// $1 tested, newest first: what the tabs' index ranges must read.
var ReferenceTab = map[Status]string{
	All:      referenceTab(`NOT ` + isArchived),
	Unread:   referenceTab(`NOT ` + isRead + ` AND NOT ` + isArchived),
	Archived: referenceTab(isArchived),
}

// ReferenceUnseen is the rows the unseen count counts, by its definition.
var ReferenceUnseen = referenceTab(`NOT ` + isArchived + ` AND NOT ` + isSeen)

func referenceTab(where string) string {
	return `SELECT n.created_at, n.id FROM notifications n, ` + Marks + ` m WHERE n.user_id = $1 AND ` + where + ` ORDER BY n.created_at DESC, n.id DESC`
}
